"""The click command line: ``lrmgym run | eval | envs | config | judge | tiny``."""

"""reasoning-gym as a task source (``env=rg``): see :mod:`lrmgym.envs.rg.env`. Needs ``pip install 'lrmgym[rg]'``."""

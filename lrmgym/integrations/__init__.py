"""Bridges to other trainers: OpenRLHF's data, plug-ins and launch (and `lrmgym serve`)."""

"""The families' networks: each ``nn.Module`` and its ``build``, one file per family.

A family's record (``models/<family>.py``) names its build here by import reference
(:class:`models.family.Network`), so torch is imported only where a network is built.
"""

"""Spot drills: AWS FIS experiments that interrupt spot nodes on purpose (``gennstack drill``).

``config`` is the ``drills`` config section (imported by ``gennstack.config``); ``templates`` builds
the experiment templates the stack deploys; ``cli`` starts and follows one. Kept import-light: the
config must not pull in boto3.
"""

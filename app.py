#!/usr/bin/env python3
"""Entry point of the CDK app for the cdk CLI (``cdk.json``): the app itself is ``gennstack_infra.app``."""

import sys

from gennstack_infra.app import main

if __name__ == "__main__":
    sys.exit(main())

"""GenNStack's AWS CDK app: the stack (``gennstack_infra.stacks``) and its constructs
(``gennstack_infra.components``).

Installed with the ``gennstack`` distribution (``pip install -e .``), beside the ``gennstack``
package of plain modules (config, values, capacity models, the command-line tools). The
dependency runs one way: these modules import ``gennstack``; nothing in ``gennstack`` imports
them, so the command-line tools never load ``aws_cdk`` or start jsii (``tests/test_layout.py``).
"""

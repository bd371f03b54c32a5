"""GenNStack: tools and typed configuration for the GenNStack CDK app."""

__version__ = "0.1.0"

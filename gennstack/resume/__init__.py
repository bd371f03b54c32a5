"""Token-exact stream resume: a relay between the gateway's two Envoy halves (issue 30).

``gennstack.resume.config`` is its configuration, ``gennstack.resume.relay`` the relay, ``gennstack.resume.cli``
the ``gennstack resume serve`` command. Plain modules: never import CDK.
"""

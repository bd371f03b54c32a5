"""GenNStack's spot interruption handler: pre-warms a generation's warm spares before its node is gone.

The Lambda asset is the ``lambdas/`` folder (handler ``interruption_handler.handler.lambda_handler``);
modules import each other relatively so the same code runs in Lambda and under pytest.
"""

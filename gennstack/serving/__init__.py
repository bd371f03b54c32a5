"""Model serving: the typed config section and the values of the ``gennstack-serving`` Helm chart.

``config`` holds :class:`ServingConfig` (validated like every other config section); ``values``
turns it, together with the rest of the GenNStack config and the CDK tokens, into the chart's
values (:func:`serving_values`).
"""

from typing import Any

from gennstack.serving.config import G6eServing, Inf2Serving, ServingConfig, Trn2Serving

_VALUES = ("NEURON_SDK_VERSION", "compile_cache_prefixes", "model_prefixes", "serving_values")

__all__ = ["G6eServing", "Inf2Serving", "ServingConfig", "Trn2Serving", *_VALUES]


def __getattr__(name: str) -> Any:
    # ``values`` needs ``gennstack.config``, which imports this package's ``config``: load it lazily.
    if name in _VALUES:
        from gennstack.serving import values

        return getattr(values, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

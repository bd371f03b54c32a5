"""``gennstack cost``: what a configuration costs per hour, and per million tokens of a benchmark.

Modules: ``prices`` (the bundled, dated price table and its lookups; ``prices.json`` beside it),
``model`` (nodes per generation and the hourly arithmetic), ``tokens`` ($ per 1M tokens of
``gennstack bench`` results), ``layouts`` (layout comparison), ``live`` (AWS Price List API and
spot price history, read-only), ``report`` (text, JSON, README markdown) and ``cli``.
"""

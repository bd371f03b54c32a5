"""``gennstack bench``: an LLMPerf-style load generator and report for OpenAI-compatible endpoints.

Modules: :mod:`.cli` (flags), :mod:`.runner` (closed-loop asyncio workers), :mod:`.metrics`
(every metric's definition), :mod:`.llmperf` (LLMPerf-compatible files), :mod:`.results`,
:mod:`.report` and :mod:`.svg` (HTML report), :mod:`.compare`, :mod:`.mockserver` (the
programmed test server) and :mod:`.upload` (S3).
"""

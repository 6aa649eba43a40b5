"""Chat rendering for token-in/token-out model calls.

* ``render``: canonical messages + tools -> the served model's chat template text and ids.
* ``prefix``: prefix reuse, bridging turn n+1 onto turn n's exact prompt and sampled ids.
* ``parsers``: reasoning and tool calls parsed from sampled text; tool results restored to call order.
"""

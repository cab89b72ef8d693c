"""The default strategies, a library: the plain batched decoder, chunked prefill, the
LRU and radix prefix caches.

The built-in plugin :mod:`mlxcore.builtin.strategies` offers them through the strategy
hooks; plugins build on them (a speculative decoder falls back to the plain decoder, a
sparse prefill to chunked prefill, the disk cache extends the radix cache). They import
the engine's contracts (:mod:`mlxcore.engine.strategies`), never the hooks, the built-in
plugins, the server or the CLI.
"""

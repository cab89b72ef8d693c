"""The HTTP server: a Litestar app whose routes come from plugins (the OpenAI
routes are the built-in plugin :mod:`mlxcore.builtin.openai`)."""

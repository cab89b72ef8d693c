"""The OpenAI Responses API front end (``/v1/responses``)."""

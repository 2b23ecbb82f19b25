"""I/O and pure: the model adapters - the OpenAI Responses and Chat Completions adapters on the official `openai`
SDK, and the script model.

This package knows nothing of Temporal: activities wrap it and map ModelCallError.kind to error types.
"""

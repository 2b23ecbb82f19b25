"""I/O and pure: the model adapters - the OpenAI Responses client and the script model.

This package knows nothing of Temporal: activities wrap it and map ModelCallError.kind to error types.
"""

"""`lookahead serve`: an OpenAI-compatible HTTP server over one continuous-batching decoding loop.

`engine.Engine` owns the model in one thread and steps every running request together (`batch.ServingLM`: one
dynamic cache, rows joining after their own prefill and leaving when done); `app.make_app` is the FastAPI app
(`/v1/chat/completions`, `/v1/completions`, `/v1/models`, `/health`, `/metrics`); `schemas` checks request bodies;
`ray_engine` runs replicas behind Ray Serve. Nothing here is imported by `import lookahead`.
"""

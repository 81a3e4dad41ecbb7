"""`lever serve`: an OpenAI-compatible HTTP server over one model (see app.py).

Modules: openai_schema (requests and responses, pure), generation_queue (the
one engine thread, FIFO, bounded, cancellable), generation (one request on
the engine), stop_strings, prom (/metrics), app (the aiohttp routes and
streaming), site (running it)."""

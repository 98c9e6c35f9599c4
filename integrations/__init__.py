"""Integrations (imported as `topas_agents.integrations`): labelling agent traffic for Topas.

- `openai_client`: `labelled(client)`, the label in force on every openai call (+ retries).
- `httpx_labels`: the same at the HTTP layer, for frameworks that build their own clients
  (LangChain/LangGraph, AutoGen, CrewAI/LiteLLM): an httpx transport / event hooks.
- `task`: `with task(...)`, a task scope that sends the server's task-done call on exit.
- `metagpt`: MetaGPT 0.8.2 (needs the `[metagpt]` install, see README); `metagpt.enable(...)`
  labels a stock MetaGPT script.

The first three import only openai/httpx/tenacity and the label module (no server, numpy,
plotting or MetaGPT); nothing here imports MetaGPT at import time.
"""

"""Integrations (imported as `topas_agents.integrations`): OpenAI client labelling and MetaGPT.

Nothing here imports MetaGPT at import time; `topas_agents.integrations.metagpt` needs the
`[metagpt]` install (see README).
"""

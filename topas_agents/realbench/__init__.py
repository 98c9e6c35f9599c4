"""Real-engine runs: labelled workflow calls against an OpenAI-compatible server.

`client` issues the calls (one httpx client, Topas labels in the body, fixed output lengths
via `max_tokens` + `ignore_eos`) and walks each task's workflow DAG, measuring job
completion time at the client.
"""

"""Adapters of agent frameworks over the client (optional extras, docs/python-client.md,
"Agent frameworks"): each module imports its framework, which the extra of the same name
installs (`pip install "kernelbox-client[smolagents]"`).

| module | what |
|---|---|
| `smolagents.py` | `KernelboxExecutor`: a remote Python executor for smolagents' `CodeAgent(executor=...)` |
| `deepagents.py` | `KernelboxSandbox`: a LangChain deepagents `BaseSandbox` (execute, upload, download) |
| `openai_agents.py` | `KernelboxSandboxClient`: an OpenAI Agents SDK sandbox client (exec, files, workspace tar) |
"""

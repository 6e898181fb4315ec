"""Adapters of agent frameworks over the client (optional extras, docs/python-client.md,
"Agent frameworks"): each module imports its framework, which the extra of the same name
installs (`pip install "kernelbox-client[smolagents]"`).

| module | what |
|---|---|
| `smolagents.py` | `KernelboxExecutor`: a remote Python executor for smolagents' `CodeAgent(executor=...)` |
| `deepagents.py` | `KernelboxSandbox`: a LangChain deepagents `BaseSandbox` (execute, upload, download) |
| `openai_agents.py` | `KernelboxSandboxClient`: an OpenAI Agents SDK sandbox client (exec, files, workspace tar) |
| `langgraph_codeact.py` | `KernelboxEval`: the `eval_fn` of LangGraph CodeAct's `create_codeact` |
| `llama_index.py` | `KernelboxCodeExecutor`: its `execute` is LlamaIndex `CodeActAgent`'s `code_execute_fn` |
| `autogen.py` | `KernelboxCodeExecutor`: an AutoGen `CodeExecutor` (Python cells, shell commands) |
| `_code.py` | what the code-acting three share: a cell as text for the model, tools sent as source |
| `_session.py` | `OwnedSession`: the caller's session, or one the adapter makes and disposes of |
"""

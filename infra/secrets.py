"""The environment variables of a run that hold secrets.

Ray writes a runtime_env's env_vars into its logs (the runtime env agent's, mode 0644, each
time a worker starts), so these reach the workers by the worker setup hook instead
(`infra.cluster.ray_cluster.secrets_hook`), and every process that logs its environment or
argv leaves them out.
"""

from __future__ import annotations

# The run's engine API key, if any (every process of a run has it; the engine server reads
# it from its environment, never argv, which `ps` shows).
API_KEY_ENV = "PRL_ENGINE_API_KEY"
SECRET_ENV = (API_KEY_ENV, "PREFECT_API_KEY")

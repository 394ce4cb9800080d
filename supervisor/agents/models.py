"""Which model each agent talks to, and the providers that reach them: made once per
model, up front for the configured agents, so that a missing key is a start-up
error and not a failed turn. Created by the gateway; shared by the agent loop and
subagent runs (a spawn may name another model)."""

from __future__ import annotations

import os

from clawsup.supervisor.agents.providers import Provider
from clawsup.supervisor.agents.providers.offline import OfflineProvider
from clawsup.supervisor.config import AgentEntry, ClawsupConfig
from clawsup.supervisor.errors import ConfigError


def model_name(m: object) -> str:
    """A model setting as written (`"provider/model"` or `{"primary": ...}`)."""
    if isinstance(m, dict):
        m = m.get("primary")
    return str(m or "")


def model_of(cfg: ClawsupConfig, agent: AgentEntry | None) -> str:
    return (model_name((agent.model if agent else None) or cfg.agents.defaults.model) or "offline").strip()


def make_provider(model: str, cfg: ClawsupConfig, *, source: str = "config") -> Provider:
    if model == "offline":
        return OfflineProvider()
    if model.startswith("anthropic/"):
        from clawsup.supervisor.agents.providers.anthropic_provider import AnthropicProvider

        p = cfg.providers.anthropic
        key = os.environ.get(p.api_key_env or "ANTHROPIC_API_KEY", "")
        if not key:
            raise ConfigError(source, [f"model {model!r} needs ${p.api_key_env or 'ANTHROPIC_API_KEY'} (providers.anthropic.apiKeyEnv)"])
        return AnthropicProvider(model.split("/", 1)[1], api_key=key, base_url=p.base_url, max_retries=p.max_retries, timeout_s=p.timeout_seconds, max_tokens=p.max_tokens)
    if "/" not in model:
        raise ConfigError(source, [f"model {model!r}: expected `offline`, `anthropic/<model>` or `<provider>/<model>`"])
    from clawsup.supervisor.agents.providers.litellm_provider import LiteLLMProvider

    lp = cfg.providers.litellm
    env_key = os.environ.get(lp.api_key_env, "") if lp.api_key_env else None
    return LiteLLMProvider(model, api_key=env_key or None, base_url=lp.base_url, max_retries=lp.max_retries, timeout_s=lp.timeout_seconds, max_tokens=lp.max_tokens)


class Models:
    def __init__(self, cfg: ClawsupConfig, *, source: str = "config") -> None:
        self._cfg = cfg
        self._source = source
        self._agents = {a.id: a for a in cfg.agents.entries}
        self._providers: dict[str, Provider] = {}
        for agent_id in cfg.agents.ids():
            self.provider(self.model_of(agent_id))

    def model_of(self, agent_id: str) -> str:
        return model_of(self._cfg, self._agents.get(agent_id))

    def provider(self, model: str) -> Provider:
        """The provider of `model`, made once; ConfigError when it cannot be (a
        missing key), which a subagent spawn naming that model reports."""
        if model not in self._providers:
            self._providers[model] = make_provider(model, self._cfg, source=self._source)
        return self._providers[model]

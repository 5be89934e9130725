"""The whole config: its sections, the checks that span sections, and what they derive together."""

from __future__ import annotations

from pathlib import Path

from pydantic import field_validator, model_validator

from guardian.actions.engine_args import Value
from guardian.analysis.leak_rule import LeakParams
from guardian.config.actions import ActionsSection
from guardian.config.base import Problem, loopback_host, Section, refuse, parse_listen
from guardian.config.engines import EngineSection, GpuSection
from guardian.config.gateway import GatewaySection
from guardian.config.guardian import GuardianSection
from guardian.config.leak import FragmentationSection, check_breaker, check_leak
from guardian.config.notify import NotifySection
from guardian.config.presets import PresetSection
from guardian.config.tune import TuneSection
from guardian.config.tuner import TunerSection
from guardian.policy.breaker import BreakerParams
from guardian.policy.profiles import BUILTIN_PRESETS, preset_args


class Config(Section):
    guardian: GuardianSection = GuardianSection()
    gpus: GpuSection = GpuSection()
    engines: list[EngineSection] = []
    presets: dict[str, PresetSection] = {}
    breaker: BreakerParams = BreakerParams()
    actions: ActionsSection = ActionsSection()
    notify: NotifySection = NotifySection()
    gateway: GatewaySection | None = None
    tuner: TunerSection = TunerSection()
    tune: TuneSection = TuneSection()
    leak: LeakParams = LeakParams()
    fragmentation: FragmentationSection = FragmentationSection()

    @field_validator("breaker")
    @classmethod
    def _breaker(cls, params: BreakerParams) -> BreakerParams:
        return check_breaker(params)

    @field_validator("leak")
    @classmethod
    def _leak(cls, params: LeakParams) -> LeakParams:
        return check_leak(params)

    @model_validator(mode="after")
    def _gateway_pools(self) -> Config:
        if self.gateway is None:
            return self
        if not self.engines:
            raise Problem("[gateway] has no engine to send requests to", "add [[engines]]")
        names = {e.name for e in self.engines}
        pools = [(f"gateway bucket {b.name!r}", b.engines) for b in self.gateway.buckets]
        found = [(f"{where} names engines that are not configured: {', '.join(unknown)}",
                  f"use names of [[engines]]: {', '.join(sorted(names))}")
                 for where, engines in pools + [("gateway.high_priority_engines", self.gateway.high_priority_engines)]
                 if (unknown := [e for e in engines if e not in names])]  # fmt: skip
        refuse(found)
        return self

    @model_validator(mode="after")
    def _presets_and_tuner(self) -> Config:
        known = sorted(set(BUILTIN_PRESETS) | set(self.presets))
        found = [(f"engines[{i}].preset {engine.preset!r} is not a preset", f"use one of {', '.join(known)}")
                 for i, engine in enumerate(self.engines) if engine.preset is not None and engine.preset not in known]  # fmt: skip
        if self.tuner.enabled:
            names = {e.name for e in self.engines}
            unknown = [e for e in self.tuner.engines if e not in names]
            if unknown:
                found.append((f"tuner.engines names engines that are not configured: {', '.join(unknown)}",
                              f"use names of [[engines]]: {', '.join(sorted(names))}"))  # fmt: skip
        refuse(found)
        return self

    def preset(self, name: str) -> PresetSection:
        return self.presets[name] if name in self.presets else PresetSection(**BUILTIN_PRESETS[name])

    def base_args(self, engine: EngineSection) -> dict[str, Value]:
        """What the engine starts with: its preset, then its own restart arguments over it."""
        layer = preset_args(self.preset(engine.preset)) if engine.preset else {}
        return {**layer, **(engine.restart.args if engine.restart else {})}

    def tuned(self, name: str) -> bool:
        return self.tuner.enabled and (not self.tuner.engines or name in self.tuner.engines)

    @field_validator("engines")
    @classmethod
    def _unique(cls, engines: list[EngineSection]) -> list[EngineSection]:
        seen: set[str] = set()
        for engine in engines:
            if engine.name in seen:
                raise Problem(f"engine name {engine.name!r} is used twice", "give every [[engines]] its own name")
            seen.add(engine.name)
        return engines

    def secret_files(self) -> list[tuple[str, Path]]:
        """The files that hold secrets, by config key: check-config wants them present and private."""
        files = [("guardian.api_token_file", self.guardian.api_token_file)]
        files += [(f"engines[{i}].api_key_file", e.api_key_file) for i, e in enumerate(self.engines)]
        files.append(("notify.webhook.token_file", self.notify.webhook.token_file if self.notify.webhook else None))
        files.append(("gateway.high_priority_keys_file", self.gateway.high_priority_keys_file if self.gateway else None))
        return [(key, path) for key, path in files if path is not None]

    def warnings(self) -> list[str]:
        """Legal but risky settings, printed by check-config and logged at start."""
        notes = []
        for i, engine in enumerate(self.engines):
            if engine.dev_mode and not engine.is_loopback:
                notes.append(
                    f"engines[{i}].url: {engine.url} is not a loopback address but dev_mode = true: vLLM's "
                    "dev endpoints (/pause, /reset_prefix_cache, …) are unauthenticated; bind vLLM to 127.0.0.1"
                )
            if engine.restart is not None and not engine.dev_mode:
                notes.append(
                    f"engines[{i}].restart: dev_mode is off, so a drained restart cannot pause vLLM; it waits for "
                    "the engine to go idle on its own (or the drain deadline) while new requests keep arriving"
                )
        for name, preset in self.presets.items():
            if preset.swap_space_gb:
                notes.append(
                    f"presets.{name}.swap_space_gb: --swap-space no longer exists in vLLM's V1 engine; "
                    "this setting is ignored"
                )
        if "sms" in self.notify.channels:
            from guardian.notify.sms import read_token

            if read_token() is None:
                notes.append(
                    "notify.sms: no Twilio auth token in $TWILIO_AUTH_TOKEN or the twilio-auth-token credential: "
                    "SMS will wait in the outbox until one is configured"
                )
        host, _ = parse_listen(self.guardian.listen)
        if not loopback_host(host):
            notes.append(f"guardian.listen: {self.guardian.listen} is reachable from other hosts")
        return notes

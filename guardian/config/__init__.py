"""guardian's TOML config: validated models and error messages a person can act on.

Every refusal names the file, the key (``engines[0].url``), what is wrong and
how to fix it, because the person reading it is usually an SRE editing a file
on a host at night, not someone who can read a pydantic traceback.

One module per section (``guardian``, ``engines``, ``presets``, ``actions``,
``notify``, ``gateway``, ``tuner``, ``tune``, ``leak``), the whole in ``model``,
reading a file and reporting its problems in ``loading``. The names below are
what the rest of guardian uses.
"""

from guardian.config.actions import ActionsSection, DegradedSection
from guardian.config.base import EXIT_CONFIG, Problem, Problems, check_gpu_id, masked_url, parse_listen
from guardian.config.engines import EngineSection, GpuSection, ProcessSection, RestartSection
from guardian.config.gateway import DEFAULT_BUCKETS, BucketSection, GatewaySection
from guardian.config.guardian import GuardianSection
from guardian.config.leak import FragmentationSection
from guardian.config.loading import ConfigError, ConfigIssue, load, loads
from guardian.config.model import Config
from guardian.config.notify import ContactSection, NotifySection, SmsSection, WebhookSection
from guardian.config.presets import PresetSection
from guardian.config.tune import TuneSection
from guardian.config.tuner import ClassSection, SloSection, TunerSection, WindowSection

__all__ = [
    "EXIT_CONFIG", "ActionsSection", "BucketSection", "ClassSection", "Config", "ConfigError", "ConfigIssue",
    "ContactSection", "DEFAULT_BUCKETS", "DegradedSection", "EngineSection", "FragmentationSection", "GatewaySection",
    "GpuSection", "GuardianSection", "NotifySection", "PresetSection", "Problem", "Problems", "ProcessSection",
    "RestartSection", "SloSection", "SmsSection", "TuneSection", "TunerSection", "WebhookSection", "WindowSection",
    "check_gpu_id", "load", "loads", "masked_url", "parse_listen",
]  # fmt: skip

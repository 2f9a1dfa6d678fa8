"""The three kinds of YAML a user writes: sweep files, launch profiles, dataset recipes.

Every model forbids unknown keys; relative paths resolve against the file that names
them; every problem is one `ConfigError` line naming the file and the field path
(`sweeps/tp8.yaml: deployments[1].launch: no such file launch/x.yaml`).
"""

from harness.config.loading import (
    ConfigError,
    LoadedLaunch,
    LoadedRecipe,
    LoadedSweep,
    load_launch,
    load_recipe,
    load_sweep,
    read_yaml_mapping,
)
from harness.config.profile import (
    INVENTED_FLAG_VALUES,
    INVENTED_SERVE_KEYS,
    KV_CACHE_DTYPES,
    BuildSpec,
    Dialect,
    HiSparseSettings,
    KVSettings,
    LaunchProfile,
    OffloadSettings,
    ServeArgs,
    SpeculativeSettings,
)
from harness.config.recipe import DatasetRecipe, PadSpec, SourceSpec, TokenizerSpec
from harness.config.sweep import ClientSettings, DeploymentSpec, PointSpec, ScrapeSettings, SweepFile

__all__ = [
    "INVENTED_FLAG_VALUES", "INVENTED_SERVE_KEYS",
    "KV_CACHE_DTYPES", "BuildSpec", "ClientSettings", "ConfigError", "DatasetRecipe", "DeploymentSpec",
    "Dialect", "HiSparseSettings", "KVSettings", "LaunchProfile", "LoadedLaunch", "LoadedRecipe",
    "LoadedSweep", "OffloadSettings", "PadSpec", "PointSpec", "ScrapeSettings", "ServeArgs", "SourceSpec",
    "SpeculativeSettings", "SweepFile", "TokenizerSpec", "load_launch", "load_recipe",
    "load_sweep", "read_yaml_mapping",
]

"""The experiment registry: params.yaml loading and schema validation (`load_params`), its expansion
into content-addressed runs and table cells (`Registry`), artifact paths and shared constants."""

from hnclip._lazy import lazy_exports

_EXPORTS = {
    "load_params": "hnclip.config.params",
    "validate_params": "hnclip.config.params",
    "ParamsError": "hnclip.config.params",
    "Registry": "hnclip.config.registry",
    "RunSpec": "hnclip.config.registry",
    "Cell": "hnclip.config.registry",
}
__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

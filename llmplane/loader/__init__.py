"""Model sources -> local files in the shared model cache (see ``locate`` for the layout)."""

from llmplane.loader.errors import LoadError
from llmplane.loader.load import is_loaded, load_model, load_model_async, model_path
from llmplane.loader.progress import ProgressFn

__all__ = ["LoadError", "ProgressFn", "is_loaded", "load_model", "load_model_async", "model_path"]

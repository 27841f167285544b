"""The engine's token ids for a request, computed by the gateway: the model's own tokenizer and
chat template from its files (``model``, ``template``, ``pieces``), or the engine's
``/tokenize`` (``remote``, ``prefix``), per model (``registry``)."""

from llmplane.gateway.tokenization.model import ModelTokenizer, TokenizerUnavailable
from llmplane.gateway.tokenization.registry import Tokenization
from llmplane.gateway.tokenization.remote import RemoteTokenizer, tokenize_body
from llmplane.gateway.tokenization.template import ChatTemplate, NoTokenIds, TemplateRefused

__all__ = [
    "ChatTemplate",
    "ModelTokenizer",
    "NoTokenIds",
    "RemoteTokenizer",
    "TemplateRefused",
    "Tokenization",
    "TokenizerUnavailable",
    "tokenize_body",
]

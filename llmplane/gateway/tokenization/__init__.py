"""The engine's token ids for a request, computed by the gateway: the model's own tokenizer and
chat template from its files (``model``, ``template``, ``pieces``), or the engine's
``/tokenize`` (``remote``), per model (``registry``)."""

from llmplane.gateway.tokenization.model import ModelTokenizer, NoTokenIds, TokenizerUnavailable
from llmplane.gateway.tokenization.registry import TokenIdSource, Tokenization, request_kind
from llmplane.gateway.tokenization.remote import RemoteTokenizer, tokenize_body
from llmplane.gateway.tokenization.template import ChatTemplate, TemplateRefused

__all__ = [
    "ChatTemplate",
    "ModelTokenizer",
    "NoTokenIds",
    "RemoteTokenizer",
    "TemplateRefused",
    "TokenIdSource",
    "Tokenization",
    "TokenizerUnavailable",
    "request_kind",
    "tokenize_body",
]

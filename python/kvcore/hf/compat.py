"""The keyword under which a transformers model takes its cache. transformers 5.25 renamed
`past_key_values` to `cache` in forward() and generate(). The old name still works there, with a
FutureWarning, and goes away in 5.40 (forward) and 6.0 (generate). 5.17 knows only the old name.
Passing the cache through cache_kwargs works across the whole supported range without warnings."""

import inspect

import kvcore


def cache_keyword(model):
    """'cache' where `model`'s forward() takes a parameter of that name (transformers >= 5.25),
    else 'past_key_values'. Reads the signature on every call: loops take it once, before."""
    forward = getattr(type(model), "forward", None)
    if not callable(forward):
        raise kvcore.InvalidArgumentError(
            f"InvalidArgument: kvcore.hf.cache_kwargs: model must be a transformers model (a module with forward()), "
            f"got {type(model).__name__}")
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


def cache_kwargs(model, cache):
    """{keyword: cache} for model(...) and model.generate(...):
    model.generate(ids, **kvcore.hf.cache_kwargs(model, cache), max_new_tokens=...)."""
    return {cache_keyword(model): cache}

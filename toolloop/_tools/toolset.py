"""I/O: declaring tools - a Toolset collects read and write tools (async functions, classes, or ready-made HTTP
contracts) and the sources they talk to, which the worker opens and closes. Every declaration goes through
the registry's checks, so what strict mode cannot honour is refused at start-up with the reason."""

from __future__ import annotations

import inspect
import logging
import typing
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, overload

from pydantic import BaseModel

from toolloop._core.arguments import argument_schema
from toolloop._core.contracts import PolicyFact
from toolloop._core.registry import ReadBack as ReadBackFn
from toolloop._core.registry import StatusQuery, ToolRegistry, ToolSource, ToolSpec
from toolloop._tools.http import HttpSource, HttpWriteContract, ReadBack, fill_path, path_fields

if TYPE_CHECKING:
    from toolloop._models.adapter import ModelAdapter

F = TypeVar("F")
logger = logging.getLogger(__name__)


class _Unset:
    def __repr__(self) -> str:
        return "<required>"


_REQUIRED: Any = _Unset()


class OpenableSource(Protocol):
    name: str

    async def open(self) -> None: ...

    async def close(self) -> None: ...


class ToolProvider(Protocol):
    """A source whose tools are known only once it is open (an MCP server lists them)."""

    name: str

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    def tool_specs(self) -> list[ToolSpec]: ...


def _default_name(target: Any) -> str:
    return str(getattr(target, "name", None) or getattr(target, "__name__", "tool"))


def _introspect(
    target: Any, what: str, given_arguments: type[BaseModel] | None = None, given_result: type[BaseModel] | None = None
) -> tuple[Callable[..., Awaitable[Any]], type[BaseModel], type[BaseModel] | None]:
    """The executor of an async function (or of a class's instances) and the argument and result models
    its annotations name (`async def tool(ctx, args: Args) -> Result`), or that the declaration gives
    (`arguments=`, `result=`: tools declared from a table, with no annotations to read)."""
    label = _default_name(target)
    if inspect.isclass(target):
        instance = target()
        call = getattr(instance, "__call__", None)  # noqa: B004 - a class whose instances are the executor
        if call is None or not inspect.iscoroutinefunction(call):
            raise ValueError(f"tool {label!r}: a {what} tool class needs `async def __call__(self, ctx, args)`")
        executor, hints_of = call, type(instance).__call__
    else:
        if not inspect.iscoroutinefunction(target):
            raise ValueError(f"tool {label!r}: a {what} tool must be an async function (async def ...)")
        executor, hints_of = target, target
    parameters = list(inspect.signature(executor).parameters.values())
    if len(parameters) != 2:
        raise ValueError(f"tool {label!r}: it must take exactly (ctx, args), not {len(parameters)} parameter(s)")
    if given_arguments is not None:
        hints: dict[str, Any] = {}
    else:
        try:
            hints = typing.get_type_hints(hints_of)
        except Exception as exc:  # a NameError from a forward reference, say
            raise ValueError(f"tool {label!r}: its annotations cannot be resolved ({exc})") from None
    arguments = given_arguments or hints.get(parameters[1].name)
    if not (isinstance(arguments, type) and issubclass(arguments, BaseModel)):
        raise ValueError(
            f"tool {label!r}: annotate its second parameter with a pydantic argument model, or give arguments="
        )
    result = given_result or hints.get("return")
    if not (isinstance(result, type) and issubclass(result, BaseModel)):
        result = None
    return executor, arguments, result


def _class_attribute(target: Any, name: str, given: Any, default: Any = None) -> Any:
    """What the decorator was given, else (for a tool class) the class attribute of that name, else `default`."""
    if given is not None and given is not _REQUIRED:
        return given
    if inspect.isclass(target) and hasattr(target, name):
        return getattr(target, name)
    return default


def _declared(
    fn: Any, name: str | None, description: str | None, redact: Iterable[str], timeout: float | None, source: Any
) -> dict[str, Any]:
    """What a read and a write declaration share: given to the decorator, else a tool class's attributes."""
    return {
        "name": name or _default_name(fn),
        "description": _class_attribute(fn, "description", description) or inspect.getdoc(fn) or "",
        "redact": tuple(redact) or tuple(_class_attribute(fn, "redact", None, ())),
        "timeout_seconds": _class_attribute(fn, "timeout", timeout),
        "source": _class_attribute(fn, "source", source),
    }


@dataclass
class Toolset:
    """The tools one agent may call. Register them with the decorators `read` and `write`, with `http_read`
    and `http_write` for the ready-made HTTP contract, or `add` a ToolSpec; `include` a source whose tools
    are discovered when it opens (an MCP server). The worker plugin opens every source before the first
    activity runs and closes them after the last."""

    registry: ToolRegistry = field(default_factory=ToolRegistry)
    _sources: dict[str, OpenableSource] = field(default_factory=dict)
    _providers: list[ToolProvider] = field(default_factory=list)
    # How many `opened()` blocks are active: only the outermost opens and closes the sources.
    _open_depth: int = 0
    # Which provider registered each of its tools (a provider opened again lists them again).
    _provided: dict[str, ToolProvider] = field(default_factory=dict)

    def add(self, spec: ToolSpec) -> ToolSpec:
        if spec.source is not None:
            self._add_source(spec.source)
        self.registry.register(spec)
        return spec

    def include(self, provider: ToolProvider) -> ToolProvider:
        """A source that lists its own tools when opened (toolloop.McpSource)."""
        if any(p.name == provider.name for p in self._providers):
            raise ValueError(f"tool source {provider.name!r} is included twice")
        self._providers.append(provider)
        return provider

    def _add_source(self, source: ToolSource) -> None:
        known = self._sources.get(source.name)
        if known is not None and known is not typing.cast(object, source):
            raise ValueError(f"two different tool sources are both named {source.name!r}")
        if not (hasattr(source, "open") and hasattr(source, "close")):
            raise ValueError(f"tool source {source.name!r} has no open() and close()")
        self._sources[source.name] = typing.cast(OpenableSource, source)

    # --- Declaring tools --------------------------------------------------------------------------------

    @overload
    def read(self, target: F, /) -> F: ...

    @overload
    def read(
        self,
        target: None = None,
        /,
        *,
        name: str | None = None,
        arguments: type[BaseModel] | None = None,
        result: type[BaseModel] | None = None,
        description: str | None = None,
        source: HttpSource | ToolSource | None = None,
        timeout: float | None = None,
        attempts: int | None = None,
        redact: Iterable[str] = (),
        summary: Callable[[Any], str] | None = None,
    ) -> Callable[[F], F]: ...

    def read(
        self,
        target: F | None = None,
        /,
        *,
        name: str | None = None,
        arguments: type[BaseModel] | None = None,
        result: type[BaseModel] | None = None,
        description: str | None = None,
        source: HttpSource | ToolSource | None = None,
        timeout: float | None = None,
        attempts: int | None = None,
        redact: Iterable[str] = (),
        summary: Callable[[Any], str] | None = None,
    ) -> Any:
        """A read-only tool: `async def tool(ctx, args: Args) -> Result` (or a class whose instances are such
        a callable); `arguments=` and `result=` give the models instead of annotations (tools declared from a
        table). A result may also be a plain value (a list, a number, a text): the model reads it as the
        output's `result`. The description defaults to the docstring; timeout and attempts default to the
        request's limits."""

        def register(fn: F) -> F:
            executor, arguments_of, result_of = _introspect(fn, "read", arguments, result)
            declared = _declared(fn, name, description, redact, timeout, source)
            attempts_of = _class_attribute(fn, "attempts", attempts)
            self.add(
                ToolSpec(
                    **declared,
                    arguments=arguments_of,
                    effect="read_only",
                    execute=executor,
                    summarize=summary,
                    result=result_of,
                    max_attempts=attempts_of,
                )
            )
            return fn

        return register(target) if target is not None else register

    @overload
    def write(
        self,
        target: None = None,
        /,
        *,
        status: StatusQuery | None = ...,
        read_back: ReadBackFn | None = ...,
        name: str | None = None,
        arguments: type[BaseModel] | None = None,
        result: type[BaseModel] | None = None,
        description: str | None = None,
        source: HttpSource | ToolSource | None = None,
        timeout: float | None = None,
        redact: Iterable[str] = (),
        summary: Callable[[Any], str] | None = None,
        canonical: Callable[[Any], Any] | None = None,
        target_of: Callable[[Any], str] | None = None,
        each_call_distinct: bool = False,
        policy_facts: Iterable[PolicyFact] = (),
    ) -> Callable[[F], F]: ...

    @overload
    def write(self, target: F, /) -> F: ...

    def write(
        self,
        target: F | None = None,
        /,
        *,
        status: StatusQuery | None = _REQUIRED,
        read_back: ReadBackFn | None = _REQUIRED,
        name: str | None = None,
        arguments: type[BaseModel] | None = None,
        result: type[BaseModel] | None = None,
        description: str | None = None,
        source: HttpSource | ToolSource | None = None,
        timeout: float | None = None,
        redact: Iterable[str] = (),
        summary: Callable[[Any], str] | None = None,
        canonical: Callable[[Any], Any] | None = None,
        target_of: Callable[[Any], str] | None = None,
        each_call_distinct: bool = False,
        policy_facts: Iterable[PolicyFact] = (),
    ) -> Any:
        """A side-effecting tool: `async def tool(ctx, args: Args) -> Result`, run only after a person approves
        exactly its arguments, with `ctx.operation_id` as its idempotency key and `ctx.approval_token` to pass
        on. `status(ctx, operation_id)` asks the service what became of an operation; `read_back(ctx, args,
        output)` checks a completed one. Both must be given; None declares on purpose that there is none (an
        unclear outcome then stays unknown and is never resent; a completed write stays unverified). A class
        may define `status` and `read_back` methods instead. `canonical(args)` normalises the arguments the
        digest and operation id are computed over. `each_call_distinct=True`: identical calls are distinct
        operations (each its own approval and effect), where by default the same payload proposed again is
        the same operation, done at most once. `policy_facts`: what an approval policy decides this write on,
        from the request's earlier reads (docs/POLICIES.md)."""
        facts = _checked_facts(name or "write", policy_facts)

        def register(fn: F) -> F:
            executor, arguments_of, result_of = _introspect(fn, "write", arguments, result)
            instance_methods: dict[str, Any] = {}
            if inspect.isclass(fn):
                instance = executor.__self__  # type: ignore[attr-defined]
                for method in ("status", "read_back", "canonical"):
                    if callable(getattr(instance, method, None)):
                        instance_methods[method] = getattr(instance, method)
            chosen_status = instance_methods.get("status", status)
            chosen_read_back = instance_methods.get("read_back", read_back)
            missing = [n for n, v in (("status", chosen_status), ("read_back", chosen_read_back)) if v is _REQUIRED]
            if missing:
                raise ValueError(
                    f"tool {name or _default_name(fn)!r}: a write tool needs {' and '.join(f'{m}=' for m in missing)} "
                    "(pass None to declare on purpose that it has none)"
                )
            self.add(
                ToolSpec(
                    **_declared(fn, name, description, redact, timeout, source),
                    arguments=arguments_of,
                    effect="side_effecting",
                    execute=executor,
                    summarize=summary,
                    status=chosen_status,
                    read_back=chosen_read_back,
                    result=result_of,
                    target=target_of,
                    each_call_distinct=each_call_distinct,
                    policy_facts=facts,
                    canonical=instance_methods.get("canonical", canonical),
                    without_status=chosen_status is None,
                    without_read_back=chosen_read_back is None,
                )
            )
            return fn

        return register(target) if target is not None else register

    def http_read(
        self,
        name: str,
        *,
        source: HttpSource,
        path: str,
        arguments: type[BaseModel],
        result: type[BaseModel],
        description: str,
        not_available: str | None = None,
        timeout: float | None = None,
        attempts: int | None = None,
        redact: Iterable[str] = (),
        summary: Callable[[Any], str] | None = None,
    ) -> ToolSpec:
        """A read-only tool that GETs `path` (its {names} filled from the arguments, under the names the model
        sees; the other arguments go in the query string) and answers with `result`. `not_available` (with
        the same {names}) is the one answer for "does not exist" and "not yours"."""
        dump = argument_schema(arguments).dump
        in_path = set(path_fields(path))
        _check_names(name, "path", path, in_path, arguments)

        async def execute(ctx: Any, args: Any) -> BaseModel:
            values = dump(args)
            query = {k: v for k, v in values.items() if k not in in_path and v is not None}
            message = (not_available or f"{name}: not available").format_map(values)
            return await source.get(ctx, fill_path(path, values), result, not_available=message, params=query)

        return self.add(
            ToolSpec(
                name=name,
                description=description,
                arguments=arguments,
                effect="read_only",
                execute=execute,
                summarize=summary,
                redact=tuple(redact),
                result=result,
                timeout_seconds=timeout,
                max_attempts=attempts,
                source=source,
            )
        )

    def http_write(
        self,
        name: str,
        *,
        source: HttpSource,
        path: str,
        arguments: type[BaseModel],
        result: type[BaseModel],
        description: str,
        read_back: ReadBack | None,
        method: str = "POST",
        status_path: str = "/operations/{operation_id}",
        timeout: float | None = None,
        redact: Iterable[str] = (),
        summary: Callable[[Any], str] | None = None,
        each_call_distinct: bool = False,
        policy_facts: Iterable[PolicyFact] = (),
    ) -> ToolSpec:
        """A side-effecting tool against a service that follows the IETF Idempotency-Key draft (as
        toolloop.servicekit does): `method` `path` with the arguments as the JSON body, the operation id as
        `Idempotency-Key` and the approval token as `X-Approval-Token`; `status_path` answers what became of an
        operation id; `read_back` checks a completed one (None: none, so it stays unverified); `policy_facts`:
        what an approval policy decides it on, from the request's earlier reads (docs/POLICIES.md)."""
        if method.upper() not in ("POST", "PUT", "PATCH", "DELETE"):
            raise ValueError(f"tool {name!r}: an HTTP write uses POST, PUT, PATCH or DELETE, not {method!r}")
        _check_names(name, "path", path, set(path_fields(path)), arguments)
        if path_fields(status_path) != ["operation_id"]:
            raise ValueError(
                f"tool {name!r}: status_path must name exactly {{operation_id}}, e.g. /operations/{{operation_id}}"
            )
        if read_back is not None:
            known = set(_alias_names(arguments)) | set(result.model_fields)
            unknown = [f for f in path_fields(read_back.path) if f not in known]
            if unknown:
                raise ValueError(
                    f"tool {name!r}: the read-back path names {', '.join(unknown)}, which is neither an argument "
                    "nor a field of the result"
                )
        contract = HttpWriteContract(
            source=source,
            method=method.upper(),
            path=path,
            result=result,
            status_path=status_path,
            read_back_spec=read_back,
            dump=argument_schema(arguments).dump,
        )
        return self.add(
            ToolSpec(
                name=name,
                description=description,
                arguments=arguments,
                effect="side_effecting",
                execute=contract.execute,
                summarize=summary,
                status=contract.status,
                read_back=contract.read_back if read_back is not None else None,
                redact=tuple(redact),
                result=result,
                timeout_seconds=timeout,
                target=contract.target,
                source=source,
                without_read_back=read_back is None,
                each_call_distinct=each_call_distinct,
                policy_facts=_checked_facts(name, policy_facts, arguments),
            )
        )

    # --- Lifecycle ---------------------------------------------------------------------------------------

    @asynccontextmanager
    async def opened(self) -> AsyncIterator[Toolset]:
        """Every source open (and the tools of the ones that list their own registered) for the block. Nested
        blocks share the outermost one's sources."""
        if self._open_depth:
            self._open_depth += 1
            try:
                yield self
            finally:
                self._open_depth -= 1
            return
        async with AsyncExitStack() as stack:
            for source in self._sources.values():
                await source.open()
                stack.push_async_callback(source.close)
            for provider in self._providers:
                await provider.open()
                stack.push_async_callback(provider.close)
                self._register_provided(provider)
            self._open_depth = 1
            try:
                yield self
            finally:
                self._open_depth = 0

    def _register_provided(self, provider: ToolProvider) -> None:
        for spec in provider.tool_specs():
            if self.registry.get(spec.name) is None:
                self.registry.register(spec)
                self._provided[spec.name] = provider
            elif self._provided.get(spec.name) is not provider:
                # Another tool already has this name: the provider's is not offered, and says why.
                reason = f"another tool of the toolset is already named {spec.name!r} (give the source a prefix)"
                refused = getattr(provider, "refused", None)
                if isinstance(refused, dict):
                    refused[spec.name] = reason
                logger.warning("tool source %r: tool %r is not offered: %s", provider.name, spec.name, reason)


def _checked_facts(
    tool: str, facts: Iterable[PolicyFact], arguments: type[BaseModel] | None = None
) -> tuple[PolicyFact, ...]:
    """The write's policy facts, each named once and matched on arguments the write has."""
    checked = tuple(facts)
    names = [fact.name for fact in checked]
    if len(set(names)) != len(names):
        raise ValueError(f"tool {tool!r}: two policy facts share a name")
    if arguments is not None:
        known = set(_alias_names(arguments))
        for fact in checked:
            unknown = sorted(set(fact.match.values()) - known)
            if unknown:
                raise ValueError(
                    f"tool {tool!r}: policy fact {fact.name!r} matches on {', '.join(unknown)}, which is not an "
                    "argument (use the names the model sees)"
                )
    return checked


def _alias_names(model: type[BaseModel]) -> list[str]:
    return [info.alias or name for name, info in model.model_fields.items()]


def _check_names(tool: str, what: str, template: str, names: set[str], arguments: type[BaseModel]) -> None:
    unknown = sorted(names - set(_alias_names(arguments)))
    if unknown:
        raise ValueError(
            f"tool {tool!r}: the {what} {template!r} names {', '.join(unknown)}, which is not an argument "
            "(use the names the model sees)"
        )


@dataclass
class AgentSpec:
    """What a worker runs an agent with: its tools, the models it may use besides the bundled ones (by the
    name a request asks for), and its instructions (a request may bring its own)."""

    tools: Toolset
    models: Mapping[str, ModelAdapter] = field(default_factory=dict)
    instructions: str | None = None

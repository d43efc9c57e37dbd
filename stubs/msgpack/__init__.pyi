# msgpack ships no type information. These are the parts trioserve uses, typed as msgpack
# 1.x documents them, so the protocol codec is checked strictly instead of seeing Any.
from collections.abc import Callable
from typing import Any

class Packer:
    def __init__(
        self,
        *,
        default: Callable[[Any], Any] | None = ...,
        use_single_float: bool = ...,
        autoreset: bool = ...,
        use_bin_type: bool = ...,
        strict_types: bool = ...,
        datetime: bool = ...,
        unicode_errors: str | None = ...,
        buf_size: int | None = ...,
    ) -> None: ...
    def pack(self, obj: object) -> bytes: ...

def unpackb(
    packed: bytes | bytearray | memoryview,
    *,
    raw: bool = ...,
    use_list: bool = ...,
    strict_map_key: bool = ...,
    max_buffer_size: int = ...,
) -> object: ...

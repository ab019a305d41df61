"""What one image or audio sample is (torch-free): :class:`MediaSpec`, a field of the job
(``WorkloadSpec.media``). ``--image-size``, ``--num-channels`` and ``--audio-seconds`` build it;
:mod:`memfit.models.media` applies it to a model's config (the patch grid, the position table,
Whisper's 30 s windows follow it)."""

from __future__ import annotations

from dataclasses import dataclass

from memfit.spec.rules import raise_if

#: The largest inputs memfit accepts (a 16k x 16k image; a day of audio).
MAX_IMAGE_SIZE = 16384
MAX_CHANNELS = 64
MAX_AUDIO_S = 86400.0


@dataclass(frozen=True, kw_only=True)
class MediaSpec:
    """What one image / audio sample is (None: the model's config says)."""

    image_size: int | None = None
    num_channels: int | None = None
    audio_seconds: float | None = None

    def __post_init__(self) -> None:
        problems = []
        for name, top in (("image_size", MAX_IMAGE_SIZE), ("num_channels", MAX_CHANNELS)):
            v = getattr(self, name)
            if v is not None and (
                isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= top
            ):
                problems.append(f"{name} ({v!r}) must be a whole number from 1 to {top}")
        s = self.audio_seconds
        ok = isinstance(s, int | float) and not isinstance(s, bool) and 0 < s <= MAX_AUDIO_S
        if s is not None and not ok:
            problems.append(f"audio_seconds ({s!r}) must be a number of seconds in (0, 86400]")
        raise_if(problems)

    @property
    def is_set(self) -> bool:
        return any(v is not None for v in (self.image_size, self.num_channels, self.audio_seconds))

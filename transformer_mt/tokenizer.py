"""Word-level, BPE and unigram tokenizers built with Hugging Face `tokenizers`, with lossless
detokenization.

Words are split on spaces and punctuation. Each word that followed a space carries the marker
`▁` (as in SentencePiece), so decoding knows where the spaces were: `decode(encode(s)) == s` for
any whitespace-normalised text whose words are all in the vocabulary (`l'uomo`, `"quoted"`, 3.5).
BPE and unigram split those same words further into subwords; their pieces are joined back without
spaces, so the round trip holds for any text whose characters were seen in training.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path
from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from .config import TokenizerConfig
from .errors import TmtError

UNK, PAD, SOS, EOS = "[UNK]", "[PAD]", "[SOS]", "[EOS]"
SPECIAL_TOKENS = [UNK, PAD, SOS, EOS]
SPACE_MARKER = "▁"
NO_CAP = 2**31 - 1

# Control characters (Unicode Cc), invisible format characters (Cf: zero-width spaces and joiners,
# direction marks, BOM, soft hyphen) and line/paragraph separators: all become spaces.
_INVISIBLE = re.compile("[\x00-\x1f\x7f-\x9f\xad\u061c\u180e\u200b-\u200f\u2028-\u202e"
                        "\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb]")


def normalize_text(text: str) -> str:
    """NFC, control and format characters to spaces, runs of white space to one space."""
    text = _INVISIBLE.sub(" ", unicodedata.normalize("NFC", text))
    return " ".join(text.split())


def _word_splitter() -> pre_tokenizers.PreTokenizer:
    """Split on spaces (marking them with ▁) and punctuation: one word-level token per piece."""
    return pre_tokenizers.Sequence([
        pre_tokenizers.Metaspace(replacement=SPACE_MARKER, prepend_scheme="always", split=True),
        pre_tokenizers.Punctuation("isolated"),
    ])


_WORD_SPLITTER = _word_splitter()


def token_limit_end(text: str, max_len: int) -> int | None:
    """None if `text` splits into at most `max_len` word-level tokens; otherwise the character
    offset where its first `max_len` tokens end (where to truncate it)."""
    # A text splits into at most len(text) + 1 pieces (a ▁ before punctuation stands alone), so
    # almost every sentence is decided without running the splitter.
    if len(text) < max_len:
        return None
    pieces = _WORD_SPLITTER.pre_tokenize_str(text)
    return pieces[max_len - 1][1][1] if len(pieces) > max_len else None


def _with_word_splitting(tokenizer: Tokenizer) -> Tokenizer:
    """Split words and punctuation; decode by joining the pieces and turning each ▁ back into a
    space."""
    tokenizer.pre_tokenizer = _word_splitter()
    tokenizer.decoder = decoders.Metaspace(replacement=SPACE_MARKER, prepend_scheme="always",
                                           split=True)
    return tokenizer


def train_tokenizer(sentences: Iterable[str], cfg: TokenizerConfig) -> Tokenizer:
    """Train a word-level, BPE or unigram tokenizer (`cfg.type`) whose ids 0..3 are [UNK] [PAD]
    [SOS] [EOS]. For a joint subword vocabulary, pass the sentences of both languages."""
    options = {"special_tokens": SPECIAL_TOKENS, "min_frequency": cfg.min_frequency,
               "show_progress": False}
    # No cap means no cap: the trainers' own default would cut at 30,000 entries.
    options["vocab_size"] = cfg.max_vocab if cfg.max_vocab is not None else NO_CAP
    if cfg.type == "bpe":
        tokenizer = _with_word_splitting(Tokenizer(models.BPE(unk_token=UNK)))
        trainer = trainers.BpeTrainer(**options)
    elif cfg.type == "unigram":
        # SentencePiece's unigram language model over the same words; it has no frequency
        # threshold (rare pieces are pruned by likelihood instead).
        del options["min_frequency"]
        tokenizer = _with_word_splitting(Tokenizer(models.Unigram()))
        trainer = trainers.UnigramTrainer(unk_token=UNK, **options)
    else:
        tokenizer = _with_word_splitting(Tokenizer(models.WordLevel(unk_token=UNK)))
        trainer = trainers.WordLevelTrainer(**options)
    tokenizer.train_from_iterator(sentences, trainer)
    return tokenizer


class TextCodec:
    """A trained tokenizer plus the special-token ids the model needs."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        ids = [tokenizer.token_to_id(token) for token in SPECIAL_TOKENS]
        if any(i is None for i in ids):
            raise TmtError("tokenizer file lacks the special tokens " + " ".join(SPECIAL_TOKENS))
        self.unk_id, self.pad_id, self.sos_id, self.eos_id = ids

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        # encode_batch_fast (tokenizers >= 0.20) skips the character offsets, unused here:
        # about 10% less CPU when a large corpus is encoded.
        encode = getattr(self.tokenizer, "encode_batch_fast", self.tokenizer.encode_batch)
        return [e.ids for e in encode(texts, add_special_tokens=False)]

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def encode_with_pieces(self, text: str) -> tuple[list[int], list[str]]:
        """Ids and, for each, the text it was made from, marked with ▁ where a space (or the
        start of the text) preceded it, as the tokenizer marks words: a piece that can stand in
        the output for an [UNK] (`decode`'s `unk_pieces`)."""
        encoding = self.tokenizer.encode(text, add_special_tokens=False)
        pieces = []
        for start, end in encoding.offsets:
            piece = text[start:end]
            if start == 0 or piece.startswith(" "):
                piece = SPACE_MARKER + piece.lstrip(" ")
            pieces.append(piece)
        return encoding.ids, pieces

    @property
    def word_level(self) -> bool:
        return isinstance(self.tokenizer.model, models.WordLevel)

    def decode(self, ids: Iterable[int], unk_pieces: dict[int, str] | None = None) -> str:
        """Text for ids, stopping at [EOS]; [SOS] and [PAD] dropped. An [UNK] at position i of
        `ids` is written as `unk_pieces[i]` when given, else kept visible as [UNK]."""
        pieces = []
        for position, i in enumerate(ids):
            if i == self.eos_id:
                break
            if i in (self.sos_id, self.pad_id):
                continue
            if unk_pieces and position in unk_pieces:
                pieces.append(unk_pieces[position])
            else:
                pieces.append(self.tokenizer.id_to_token(i))
        return self.tokenizer.decoder.decode(pieces)

    def tokens(self, ids: Iterable[int]) -> list[str]:
        return [self.tokenizer.id_to_token(i) for i in ids]

    def to_str(self) -> str:
        return self.tokenizer.to_str()

    @classmethod
    def from_str(cls, text: str) -> "TextCodec":
        try:
            return cls(Tokenizer.from_str(text))
        except Exception as exc:  # tokenizers raises a bare Exception on malformed JSON
            raise TmtError(f"invalid tokenizer data ({str(exc).splitlines()[0]})") from None

    def save(self, path: Path) -> None:
        path.write_text(self.to_str(), encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> "TextCodec":
        if not path.is_file():
            raise TmtError(f"tokenizer file not found: {path}")
        try:
            return cls.from_str(path.read_text(encoding="utf-8"))
        except TmtError as exc:
            raise TmtError(f"{path}: {exc}") from None

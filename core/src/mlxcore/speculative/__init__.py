"""What every speculative decoder shares: the acceptance rules that keep the output
identical (greedy) or identical in distribution (sampling) to plain decoding
(:mod:`.accept`), and one verification pass over a batch with an exact per-row rollback
of attention and recurrent caches (:mod:`.verify`).

Used by the ``qwen35-mtp`` plugin (drafts from the checkpoint's MTP head) and by
``prompt-lookup`` (drafts copied from the prompt); a decoder differs only in how it
proposes drafts.
"""

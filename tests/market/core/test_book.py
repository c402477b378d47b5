"""A clearing's book as JSON (`market.core.book`): what is written is read back the same."""

from __future__ import annotations

import json

from market.core.book import book_json, read_book

BOOK = {
    "levels": ["spine", "leaf", "node"],
    "nodes": [{"name": "n1", "gpu_model": "H100", "labels": {"spine": "s0", "leaf": "l0"},
               "reserve_prices": ["2.10", "2.10", "2.35"], "runtime": "slurm"},
              {"name": "n2", "gpu_model": "H200", "labels": {"spine": "s0", "leaf": "l1"},
               "reserve_prices": ["3.00"]}],
    "bids": [
        {"id": "b1", "gpus": 2, "hours": "4", "max_price_per_gpu_hour": "2.50",
         "gpu_models": ["H100"], "topology": {"required": "leaf", "slice": {"size": 2}},
         "runtimes": ["slurm"], "submitted_at": "2026-12-03T10:00:00+00:00"},
        {"id": "b2", "alternatives": [
            {"gpus": 1, "hours": "1.5", "max_price_per_gpu_hour": "2.40", "gpu_models": ["H100"]},
            {"gpus": 1, "hours": "2", "max_price_per_gpu_hour": "3.10", "gpu_models": ["H200"],
             "topology": {"required": "node"}}]},
    ],
}


def test_a_book_written_from_what_was_read_reads_back_the_same():
    book = read_book(BOOK)
    written = book_json(book.levels, book.nodes, book.bids)
    assert read_book(json.loads(json.dumps(written))) == book
    assert written == BOOK

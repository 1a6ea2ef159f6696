"""How many token ids one record of a converted dataset holds: a fact of the format that the converter
writes by (`--max_record_tokens`) and the doctor reads by (a longer record costs memory where it is parsed).
"""
from __future__ import annotations

# The most ids one record holds (--max_record_tokens; 0: a document is one record, however long): 64K ids
# parse in a few MB, and are longer than any row a model trains on today. A longer document is stored as
# consecutive records of at most this many ids.
MAX_RECORD_TOKENS = 65_536

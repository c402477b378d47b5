"""The pool's pure cores: the quota arithmetic and admission of private pools (`quotas`, with
its database side in `pool/quotas.py`) and the catalogue of GPU models (`catalogue`), plain
Python with no Django."""

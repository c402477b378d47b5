FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 DJANGO_SETTINGS_MODULE=ibex.settings \
    IBEX_VAR_DIR=/app/var
WORKDIR /app

COPY pyproject.toml README.md ./
COPY ibex ibex
COPY fabric fabric
COPY pool pool
COPY market market
COPY scheduler scheduler
COPY web web
COPY manage.py ./
RUN pip install . && useradd --create-home ibex

# Static files are collected at build time; no database or Redis is needed for that.
RUN DATABASE_URL=postgresql://build@localhost/build REDIS_URL=redis://localhost:6379/0 \
    SECRET_KEY=build-only-build-only-build-only-build-only-build-only \
    STATIC_ROOT=/app/static python manage.py collectstatic --noinput
ENV STATIC_ROOT=/app/static WHITENOISE_USE_FINDERS=0

RUN mkdir -p /app/var && chown ibex /app/var
USER ibex
EXPOSE 8000
CMD ["gunicorn", "ibex.wsgi:application", "--bind", "0.0.0.0:8000", "--workers", "3", \
     "--worker-class", "gthread", "--threads", "16"]

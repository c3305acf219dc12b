# One image for every role: migrate, beat, worker and Flower differ only by command.
FROM python:3.11-slim
WORKDIR /srv
COPY pyproject.toml README.md ./
COPY beat ./beat
RUN pip install --no-cache-dir . && rm -rf /srv/beat /srv/build
# The demo app and its jobs run from /srv; the code stays owned by root, so the
# processes (user nobody) can read it but never change it.
COPY app ./app
COPY tasks ./tasks
ENV PYTHONPATH=/srv
USER nobody

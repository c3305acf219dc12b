# One image for every role: migrate, beat, worker and Flower differ only by command.
FROM python:3.11-slim
WORKDIR /srv
COPY pyproject.toml README.md ./
COPY app ./app
COPY beat ./beat
COPY tasks ./tasks
RUN pip install --no-cache-dir -e . && chown -R nobody /srv
USER nobody

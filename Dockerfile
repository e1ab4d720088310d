# Multi-stage build: compile in the Rust image, run in a slim Debian with the example config.
#   docker build -t tollgate .
#   docker run --rm -p 8080:8080 -p 9100:9100 tollgate
FROM rust:1-bookworm AS build
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends cmake pkg-config libssl-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY benches ./benches
RUN cargo build --release --locked --bin tollgate

FROM debian:bookworm-slim
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends ca-certificates libssl3 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --no-create-home tollgate
COPY --from=build /src/target/release/tollgate /usr/local/bin/tollgate
COPY conf /etc/tollgate
# The example listens on 127.0.0.1; inside a container, listen on every interface.
RUN sed -i 's/127.0.0.1:8080/0.0.0.0:8080/; s/"127.0.0.1:9100"/"0.0.0.0:9100"/' /etc/tollgate/tollgate.yaml \
 && tollgate check --config /etc/tollgate/tollgate.yaml
USER tollgate
EXPOSE 8080 9100
ENTRYPOINT ["tollgate", "run", "--config", "/etc/tollgate/tollgate.yaml", "--upgrade-sock", "/tmp/tollgate_upgrade.sock", "--pid-file", "/tmp/tollgate.pid"]

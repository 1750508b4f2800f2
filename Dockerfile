# syntax=docker/dockerfile:1
# A small image for `sluice serve --kubernetes` (see deploy/ and the README).
#
#   docker build -t ghcr.io/sluice-dev/sluice:dev .
#
# Stage 1 builds the binary as shipped (`--profile dist`: fat LTO, one
# codegen unit; symbols stripped); stage 2 is distroless
# with glibc only, running as the non-root user 65532.
FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
COPY . .
ENV CARGO_PROFILE_DIST_DEBUG=0 \
    CARGO_PROFILE_DIST_STRIP=symbols
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --profile dist --locked --bin sluice \
    && cp target/dist/sluice /usr/local/bin/sluice

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /usr/local/bin/sluice /usr/local/bin/sluice
USER 65532:65532
# Few glibc malloc arenas: RSS stays near the first route table's across
# reloads (docs/performance.md, "Scale and rebuild").
ENV MALLOC_ARENA_MAX=2
EXPOSE 80 9901
ENTRYPOINT ["/usr/local/bin/sluice"]
CMD ["serve", "--kubernetes", "--admin=0.0.0.0:9901"]

//! Link the `sluice` executable with packed relative relocations (DT_RELR):
//! a position-independent executable's relocation table shrinks from about
//! 1.4 MB to a few KB, which the dynamic loader reads and walks at every
//! start (half of the page faults of an idle start, and as much resident
//! memory; docs/performance.md, idle RSS). GNU ld 2.38 and later and lld
//! know the option and use it only when the C library supports it (glibc
//! 2.36 and later); older GNU ld warns and ignores it.
fn main() {
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
    println!("cargo:rerun-if-changed=build.rs");
}

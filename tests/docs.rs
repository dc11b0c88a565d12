//! The committed reader docs are what the registry generates today.

#[test]
fn committed_docs_are_up_to_date() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    for (file, generated) in [
        ("docs/CACHE_SEMANTICS.md", cachewright::docs::markdown()),
        ("docs/cache-keys.ts", cachewright::docs::typescript()),
    ] {
        let committed = std::fs::read_to_string(root.join(file)).unwrap_or_default();
        assert!(
            committed == generated,
            "{file} is out of date: run `cargo run -- keys --format {}` > {file}",
            if file.ends_with(".md") { "markdown" } else { "typescript" }
        );
    }
}

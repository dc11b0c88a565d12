//! `cachewright fixtures`: development data sets.

use super::*;

pub async fn generate(global: &GlobalArgs, args: &GenerateArgs) -> anyhow::Result<ExitCode> {
    let cfg = load_config(global)?;
    let source = cachewright::source::Source::connect(&cfg).await?;
    let progress = Progress::auto();
    let stage = progress.stage("generating videos", args.videos as u64);
    let shape = cachewright::generate::Shape {
        channels: args.channels,
        categories: args.categories,
        tags: args.tags,
        videos: args.videos,
    };
    let counts =
        cachewright::generate::generate(source.database(), &cfg.collections, shape, args.seed, |n| stage.inc(n))
            .await
            .context("writing the generated data set to MongoDB failed")?;
    stage.finish();
    tracing::info!(
        channels = counts[0],
        categories = counts[1],
        tags = counts[2],
        videos = counts[3],
        seed = args.seed,
        "data set generated"
    );
    Ok(ExitCode::SUCCESS)
}

pub async fn load(global: &GlobalArgs, args: &LoadArgs) -> anyhow::Result<ExitCode> {
    let cfg = load_config(global)?;
    let c = &cfg.collections;
    let sets = cachewright::fixtures::read_dir(&args.dir, &[&c.channel, &c.category, &c.tag, &c.video])?;
    let source = cachewright::source::Source::connect(&cfg).await?;
    cachewright::fixtures::load(source.database(), &sets).await.context("loading fixtures into MongoDB failed")?;
    for (name, docs) in &sets {
        tracing::info!(collection = %name, documents = docs.len(), "fixtures loaded");
    }
    Ok(ExitCode::SUCCESS)
}

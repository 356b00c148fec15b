//! The adapter for the fake harness family: directives are the whole "task", the contract
//! and challenge are fetched over the lane socket, and it keeps no state of its own.

use super::{
    expand, AckMethod, Adapter, ContractInjection, Family, HookEvent, HookRefusal, PrepareCtx,
    Prepared, RegistryError,
};

pub struct Fake;

impl Adapter for Fake {
    fn family(&self) -> Family {
        Family::Fake
    }

    fn validate_directives(&self, directives: &[String]) -> Result<(), RegistryError> {
        crate::fake_harness::parse_all(directives)
            .map(|_| ())
            .map_err(|e| RegistryError::Directives {
                family: "fake".into(),
                detail: e.to_string(),
            })
    }

    fn forbidden_args(&self) -> &'static [&'static str] {
        &[]
    }

    fn allowed_args(&self) -> &'static [&'static str] {
        &["{directives}", "--probe-version"]
    }

    fn surfaces(&self) -> (ContractInjection, AckMethod) {
        (ContractInjection::SocketFetch, AckMethod::LaneCli)
    }

    fn prepare(&self, ctx: &PrepareCtx<'_>) -> Result<Prepared, RegistryError> {
        // Like every real harness: its home, temp and working directory in its private
        // area, the only places a confined generation can write.
        let (home, tmp, work) = (
            ctx.state_dir.join("home"),
            ctx.state_dir.join("tmp"),
            ctx.state_dir.join("work"),
        );
        for d in [&home, &tmp, &work] {
            crate::util::durable::ensure_dir(d, 0o700).map_err(|e| RegistryError::Prepare {
                family: "fake".into(),
                dir: ctx.state_dir.to_path_buf(),
                detail: format!("{}: {e}", d.display()),
            })?;
        }
        let s = |p: &std::path::Path| p.display().to_string();
        Ok(Prepared {
            argv: expand(&ctx.plan.template, &ctx.plan.vars, &ctx.plan.directives),
            env: vec![("HOME".into(), s(&home)), ("TMPDIR".into(), s(&tmp))],
            cwd: Some(ctx.working_dir(&work)),
            conversation_id: None,
        })
    }

    fn hook(
        &self,
        event: &str,
        _payload: &serde_json::Value,
        _conversation: Option<&str>,
    ) -> Result<HookEvent, HookRefusal> {
        Err(HookRefusal::Unexpected(format!(
            "the fake harness has no hook {event:?}"
        )))
    }

    fn render_contract(&self, contract: &str) -> String {
        contract.to_string()
    }

    fn continuation_delivery(&self) -> super::ContinuationDelivery {
        super::ContinuationDelivery::LaneNext
    }

    fn observes_progress(&self) -> bool {
        false
    }

    // What it printed (`print=`), kept in its home.
    fn artifact_paths(&self) -> &'static [&'static str] {
        &["home/transcript"]
    }
}

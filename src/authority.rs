//! Tool calls from inside a kernel, under the authority of one cell (`docs/architecture.md`, trust boundary).
//!
//! Interpreter state persists across cells; authority does not. Each cell gets a fresh
//! [`CellAuthority`] holding the caller's [`ToolDispatcher`], its allow-list and its budget.
//! When the cell settles the authority is retired, and any call that still names it is refused.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::value::RawValue;
use serde_json::Value;

pub use crate::cell::messages::RETIRED_MESSAGE;

/// One tool call, as a dispatcher sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// Tool name (on the allow-list).
    pub tool: String,
    /// Keyword arguments, a JSON object.
    pub args: Value,
    /// Task id of the turn the cell belongs to.
    pub task_id: Option<String>,
    /// Tenant of the kernel.
    pub tenant: String,
    /// Session of the kernel.
    pub session: String,
    /// Delegated child, when the kernel is a child's.
    pub child: Option<String>,
    /// Cell number within the kernel.
    pub cell: u64,
}

/// One tool call with its arguments as the kernel wrote them: JSON text of an object, not
/// parsed into a tree (a kernel's arguments are the cell's, so possibly hostile; a
/// `serde_json::Value` can take many times the size of its text).
#[derive(Debug, Clone)]
pub struct RawToolCall {
    /// Tool name (on the allow-list).
    pub tool: String,
    /// Keyword arguments, the text of a JSON object.
    pub args: Box<RawValue>,
    /// Task id of the turn the cell belongs to.
    pub task_id: Option<String>,
    /// Tenant of the kernel.
    pub tenant: String,
    /// Session of the kernel.
    pub session: String,
    /// Delegated child, when the kernel is a child's.
    pub child: Option<String>,
    /// Cell number within the kernel.
    pub cell: u64,
}

impl RawToolCall {
    /// The call with its arguments parsed.
    pub fn parse(self) -> Result<ToolCall, String> {
        let args = serde_json::from_str(self.args.get())
            .map_err(|e| format!("the tool call's arguments are not valid JSON: {e}"))?;
        Ok(ToolCall {
            tool: self.tool,
            args,
            task_id: self.task_id,
            tenant: self.tenant,
            session: self.session,
            child: self.child,
            cell: self.cell,
        })
    }
}

/// Host-side tool execution, supplied with each execute request.
#[async_trait]
pub trait ToolDispatcher: Send + Sync {
    /// Runs a tool; `Err` carries a message the cell sees as a `kernel_tools.ToolError`.
    async fn dispatch(&self, call: ToolCall) -> Result<Value, String>;

    /// Runs a tool from its raw arguments and answers raw JSON; this is what kernels call.
    /// The default parses the arguments, runs [`Self::dispatch`] and serialises its answer;
    /// a dispatcher that only forwards JSON (as the HTTP server's does) overrides it to pass
    /// the text through without building a tree.
    async fn dispatch_raw(&self, call: RawToolCall) -> Result<Box<RawValue>, String> {
        let value = self.dispatch(call.parse()?).await?;
        serde_json::value::to_raw_value(&value)
            .map_err(|e| format!("the tool's result could not be serialised: {e}"))
    }
}

/// A dispatcher made from a closure (handy for library callers and tests).
pub struct FnDispatcher<F>(pub F);

#[async_trait]
impl<F> ToolDispatcher for FnDispatcher<F>
where
    F: Fn(ToolCall) -> Result<Value, String> + Send + Sync,
{
    async fn dispatch(&self, call: ToolCall) -> Result<Value, String> {
        (self.0)(call)
    }
}

/// The rights of one cell: who asked, which tools, what budget. Installed when the cell
/// starts, retired when it settles.
pub struct CellAuthority {
    task_id: Option<String>,
    dispatcher: Option<Arc<dyn ToolDispatcher>>,
    allowed: BTreeSet<String>,
    max_calls: u32,
    made: AtomicU32,
    active: AtomicBool,
}

impl std::fmt::Debug for CellAuthority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CellAuthority")
            .field("task_id", &self.task_id)
            .field("allowed", &self.allowed)
            .field("made", &self.calls_made())
            .field("active", &self.is_active())
            .finish()
    }
}

impl CellAuthority {
    /// A fresh, active authority.
    pub fn new(
        task_id: Option<String>,
        dispatcher: Option<Arc<dyn ToolDispatcher>>,
        allowed: BTreeSet<String>,
        max_calls: u32,
    ) -> CellAuthority {
        CellAuthority {
            task_id,
            dispatcher,
            allowed,
            max_calls,
            made: AtomicU32::new(0),
            active: AtomicBool::new(true),
        }
    }

    /// True until the cell settles.
    pub fn is_active(&self) -> bool {
        self.active.load(Ordering::Acquire)
    }

    /// Retires the authority: every later dispatch is refused.
    pub fn retire(&self) {
        self.active.store(false, Ordering::Release);
    }

    /// Calls dispatched so far (refusals do not count).
    pub fn calls_made(&self) -> u32 {
        self.made.load(Ordering::Acquire)
    }

    /// The task id the cell runs for.
    pub fn task_id(&self) -> Option<&str> {
        self.task_id.as_deref()
    }

    /// Checks a call against this authority and, when allowed, counts it against the budget.
    /// Returns the dispatcher to run it with.
    pub fn admit(&self, tool: &str) -> Result<Arc<dyn ToolDispatcher>, String> {
        if !self.is_active() {
            return Err(RETIRED_MESSAGE.to_string());
        }
        let dispatcher = match (&self.dispatcher, self.allowed.contains(tool)) {
            (Some(d), true) => d.clone(),
            _ => {
                let available = if self.dispatcher.is_none() || self.allowed.is_empty() {
                    "none".to_string()
                } else {
                    self.allowed.iter().cloned().collect::<Vec<_>>().join(", ")
                };
                return Err(crate::cell::messages::unknown_tool_message(
                    tool, &available,
                ));
            }
        };
        let admitted = self
            .made
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max_calls).then_some(n + 1)
            });
        if admitted.is_err() {
            return Err(crate::cell::messages::budget_message(self.max_calls));
        }
        Ok(dispatcher)
    }

    /// Checks and runs a call under this authority.
    pub async fn dispatch(&self, call: ToolCall) -> Result<Value, String> {
        let dispatcher = self.admit(&call.tool)?;
        dispatcher.dispatch(call).await
    }

    /// Checks and runs a call with raw arguments under this authority (see
    /// [`ToolDispatcher::dispatch_raw`]).
    pub async fn dispatch_raw(&self, call: RawToolCall) -> Result<Box<RawValue>, String> {
        let dispatcher = self.admit(&call.tool)?;
        dispatcher.dispatch_raw(call).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(tool: &str) -> ToolCall {
        ToolCall {
            tool: tool.into(),
            args: serde_json::json!({}),
            task_id: None,
            tenant: "t".into(),
            session: "s".into(),
            child: None,
            cell: 1,
        }
    }

    fn echo() -> Arc<dyn ToolDispatcher> {
        Arc::new(FnDispatcher(|c: ToolCall| {
            Ok(serde_json::json!({ "tool": c.tool }))
        }))
    }

    #[tokio::test]
    async fn a_settled_cells_authority_refuses_dispatch() {
        let authority = CellAuthority::new(Some("turn-1".into()), None, BTreeSet::new(), 50);
        authority.retire();
        let err = authority.dispatch(call("web_search")).await.unwrap_err();
        assert!(err.contains("No active execute_code cell"), "{err}");
    }

    #[tokio::test]
    async fn allow_list_and_budget_refuse_without_counting() {
        let allowed = BTreeSet::from(["web_search".to_string()]);
        let authority = CellAuthority::new(None, Some(echo()), allowed, 2);
        let err = authority.dispatch(call("rm_rf")).await.unwrap_err();
        assert!(err.contains("Available tools: web_search"), "{err}");
        assert_eq!(authority.calls_made(), 0);
        authority.dispatch(call("web_search")).await.unwrap();
        authority.dispatch(call("web_search")).await.unwrap();
        let err = authority.dispatch(call("web_search")).await.unwrap_err();
        assert!(err.contains("budget exhausted"), "{err}");
        assert_eq!(authority.calls_made(), 2);
    }
}

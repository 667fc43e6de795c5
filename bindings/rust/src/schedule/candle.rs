//! The candle side of an [`Update`] (feature `candle`): the backward pass and
//! the optimizer step as the update's spans, gradients and statistics
//! recorded where the update is recorded.
use candle_core::backprop::GradStore;
use candle_core::Tensor;
use candle_nn::{Optimizer, VarMap};

use super::{Update, UpdateSpan};
use crate::candle::{Stats, UpdateSpans};
use crate::error::Result;
use crate::session::Step;

impl Update<'_> {
    /// `optimizer.backward_step(loss)` split for the update: `loss.backward()`
    /// in a `train/backward` span (tagged backward), one gradient fact per
    /// `varmap` variable under `root` in the session recording the update
    /// (as the tracer's own work: [`crate::SessionRef::tracer_work`]), then
    /// `optimizer.step` in a `train/optimizer` span (tagged optimizer). In a
    /// flight recorder the gradients are kept (shared, not copied) and reduced
    /// only if the update is written. Returns the gradients.
    pub fn backward_step<O: Optimizer>(
        &self,
        optimizer: &mut O,
        loss: &Tensor,
        root: &str,
        varmap: &VarMap,
    ) -> Result<GradStore> {
        self.backward_step_named(optimizer, loss, root, varmap, UpdateSpans::default())
    }

    /// [`Update::backward_step`] with span names of your choice.
    pub fn backward_step_named<O: Optimizer>(
        &self,
        optimizer: &mut O,
        loss: &Tensor,
        root: &str,
        varmap: &VarMap,
        names: UpdateSpans<'_>,
    ) -> Result<GradStore> {
        let grads = {
            let _b = self.span(names.backward, Step::Backward)?;
            loss.backward()?
        };
        match self.trace() {
            // A flight recorder's update is nearly always dropped: its gradients
            // are reduced only if it is written (Update::record_held_gradients),
            // not in every update (reading every gradient is memory traffic of
            // the size of the optimizer's).
            Some(_) if self.kind == super::Kind::Flight => {
                let (root, taken) = (
                    root.to_string(),
                    crate::candle::gradients_of(&grads, varmap),
                );
                *self.gradients.borrow_mut() =
                    Some(Box::new(move |t: &crate::session::SessionRef| {
                        t.record_gradients_of(&root, &taken).map(|_| ())
                    }));
            }
            Some(t) => {
                let _w = t.tracer_work()?;
                t.record_gradients(root, &grads, varmap)?;
            }
            None => {}
        }
        {
            let _o = self.span(names.optimizer, Step::Optimizer)?;
            optimizer.step(&grads)?;
        }
        Ok(grads)
    }

    /// Reads the scalar `loss` back and gives it to [`Update::loss`]. Returns it.
    pub fn loss_of(&self, loss: &Tensor) -> Result<f32> {
        let v = loss.to_scalar::<f32>()?;
        self.loss(v);
        Ok(v)
    }
}

impl UpdateSpan<'_> {
    /// Reduces `t` and records its statistics under `label` in this span,
    /// when the update is captured in full (not in a flight recorder, nor in
    /// an update that is not recorded: then `Ok(None)`, nothing computed),
    /// as the tracer's own work.
    pub fn record_tensor_stats(&self, label: &str, t: &Tensor) -> Result<Option<Stats>> {
        let (Some(s), Some(id)) = (self.full_capture(), self.id()) else {
            return Ok(None);
        };
        let _w = s.tracer_work()?;
        s.record_tensor_stats(id, label, t).map(Some)
    }
}

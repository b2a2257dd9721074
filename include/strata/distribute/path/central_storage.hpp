#pragma once
/// \file strata/distribute/path/central_storage.hpp
/// The gradient path of `CentralStorage<P, Synchronous>`: one copy of the variables on the
/// central device (replica 0's); gradients are reduced onto it by slices and applied there,
/// and every replica reads the updated variables at the next step.

#include "strata/distribute/gradient_path.hpp"
#include "strata/distribute/strategy_classes.hpp"

namespace strata::distribute {

template <class P, class Net, class T>
class GradientPath<CentralStorage<P, sync::Synchronous>, Net, T>
    : public detail::LockstepPath<GradientPath<CentralStorage<P, sync::Synchronous>, Net, T>, CentralStorage<P, sync::Synchronous>,
                                  Net, T> {
    using Strategy = CentralStorage<P, sync::Synchronous>;
    using Base = detail::LockstepPath<GradientPath, Strategy, Net, T>;
    static constexpr std::int64_t num_params = Net::num_params;

public:
    // The defaults this path takes, by name (detail::PathBase says why).
    using Base::lockstep, Base::pipelined, Base::captures_step, Base::unit_network, Base::model_summary;
    using Base::gradient_buckets, Base::expected_updates, Base::end_epoch, Base::is_chief, Base::per_worker_input;
    using Base::sum_over_workers, Base::sum_outputs_over_workers, Base::after_save, Base::gathers_state, Base::bind_unit;
    using Base::gradient_ready, Base::combine_totals;
    using Base::syncs_batch_statistics, Base::replica_sum, Base::run_where_loss_runs;

    template <class Init>
    GradientPath(Strategy& s, Init&& init) : Base(s) {
        this->run_units([&](int r) {
            if (r != 0) return;
            params_.resize(Shape{num_params});
            central_grads_.resize(Shape{num_params});
        });
        init(params_.data());
    }

    T* params(int) { return params_.data(); }

    void compile(const optim::Optimizer& o, const collective::Settings&) {  // one process: nothing to agree
        this->opt_.states.clear();
        this->opt_.states.resize(1);
        this->run_units([&](int r) {
            if (r == 0) this->opt_.states[0] = optim::OptimizerState<T, P>(o, num_params, detail::moving_ranges<Net>());
        });
    }

    /// Replica r sums its slice of every replica's gradient (in replica order, so the result
    /// does not depend on timing), then updates that slice of the central variables. The step
    /// ends when all are done, so the next step reads updated variables. With global_clipnorm,
    /// the norm is the whole reduced gradient's: once every slice is summed, replica 0 computes
    /// it (prepare_step) before any slice is applied.
    void apply(int r) {
        auto& group = this->strategy_->group();
        auto& state = this->opt_.states[0];
        const int n = this->units();
        P::synchronize();  // device places: this replica's gradient is complete before others read it
        group.barrier(r);
        const auto sl = replica_slice(num_params, n, r);
        if (sl.count > 0) {
            const TensorView<T, P> central(central_grads_.data() + sl.first, Shape{sl.count});
            copy(TensorView<T, P>(this->grads(0) + sl.first, Shape{sl.count}), central);
            for (int q = 1; q < n; ++q) axpy(T(1), TensorView<T, P>(this->grads(q) + sl.first, Shape{sl.count}), central);
        }
        if (state.clips_gradients()) {
            P::synchronize();  // this replica's slice is summed
            group.barrier(r);  // every slice is
            if (r == 0) {
                state.prepare_step(central_grads_.data());
                P::synchronize();  // the scale is written before any replica's update reads it
            }
            group.barrier(r);
        }
        if (sl.count > 0) state.apply_range(params_.data(), central_grads_.data(), sl.first, sl.count);
        P::synchronize();  // the update is done before the step ends
    }
    /// The slices were applied without advancing the optimizer's count: once per step here.
    void end_step() { this->opt_.states[0].advance(); }

    std::vector<T> get_weights() const { return to_vector(TensorView<T, P>(const_cast<T*>(params_.data()), Shape{num_params})); }
    void set_weights(const std::vector<T>& w) {
        copy(TensorView<T, place::Host>(const_cast<T*>(w.data()), Shape{num_params}), params_.view());
    }
    void log_placement() { detail::log_variable_copies(&Net::parameters, this->strategy_->devices(), 1); }

private:
    Tensor<T, P> params_, central_grads_;
};

}  // namespace strata::distribute

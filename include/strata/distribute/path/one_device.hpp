#pragma once
/// \file strata/distribute/path/one_device.hpp
/// The gradient path of `Default` and `OneDevice<P>`: one replica, one copy of the variables,
/// gradients applied directly.

#include "strata/distribute/gradient_path.hpp"
#include "strata/distribute/strategy_classes.hpp"

namespace strata::distribute {

namespace detail {
template <class Strategy, class Net, class T>
class SingleCopyPath : public LockstepPath<SingleCopyPath<Strategy, Net, T>, Strategy, Net, T> {
    using Base = LockstepPath<SingleCopyPath, Strategy, Net, T>;
    using P = typename Base::P;
    static constexpr std::int64_t num_params = Net::num_params;

public:
    // The defaults this path takes, by name (PathBase says why).
    using Base::lockstep, Base::pipelined, Base::unit_network, Base::model_summary;
    using Base::gradient_buckets, Base::expected_updates, Base::end_epoch, Base::is_chief, Base::per_worker_input;
    using Base::sum_over_workers, Base::sum_outputs_over_workers, Base::after_save, Base::gathers_state, Base::bind_unit;
    using Base::gradient_ready, Base::end_step, Base::combine_totals;
    using Base::syncs_batch_statistics, Base::replica_sum, Base::run_where_loss_runs;
    /// One replica on the calling thread, its gradients applied after backward: a place that can
    /// capture the whole step may (PathBase::captures_step).
    static constexpr bool captures_step = true;

    template <class Init>
    SingleCopyPath(Strategy& s, Init&& init) : Base(s) {
        this->run_units([&](int) { params_.resize(Shape{num_params}); });
        init(params_.data());
    }
    T* params(int) { return params_.data(); }
    void compile(const optim::Optimizer& o, const collective::Settings&) {  // one process: nothing to agree
        this->opt_.states.clear();
        this->run_units([&](int) { this->opt_.states.emplace_back(o, num_params, moving_ranges<Net>()); });
    }
    void apply(int r) { this->opt_.states[0].apply(params_.data(), this->grads(r)); }

    std::vector<T> get_weights() const { return to_vector(TensorView<T, P>(const_cast<T*>(params_.data()), Shape{num_params})); }
    void set_weights(const std::vector<T>& w) {
        copy(TensorView<T, place::Host>(const_cast<T*>(w.data()), Shape{num_params}), params_.view());
    }
    void log_placement() { log_variable_copies(&Net::parameters, this->strategy_->devices(), 1); }

private:
    Tensor<T, P> params_;
};
}  // namespace detail

template <class Net, class T>
class GradientPath<Default, Net, T> : public detail::SingleCopyPath<Default, Net, T> {
    using detail::SingleCopyPath<Default, Net, T>::SingleCopyPath;
};

template <class P, class Net, class T>
class GradientPath<OneDevice<P>, Net, T> : public detail::SingleCopyPath<OneDevice<P>, Net, T> {
    using detail::SingleCopyPath<OneDevice<P>, Net, T>::SingleCopyPath;
};

}  // namespace strata::distribute

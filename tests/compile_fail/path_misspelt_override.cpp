// A gradient path that misspells an override (is_cheif for is_chief) does not silently get
// PathBase's default (true: every process would write the checkpoints): the path has no
// public is_chief, and the message names it and both ways to provide it.
// expect: strata::distribute::GradientPath: the path has no public is_chief(); define it, or take detail::PathBase's default by name
#include <strata/strata.hpp>

// A strategy of one's own: one replica on the host, where only "rank 0" is the chief.
struct RankedDevice : strata::distribute::OneDevice<strata::place::Host> {
    using strategy_tag = RankedDevice;
    int rank = 0;
};

namespace strata::distribute {
template <class Net, class T>
class GradientPath<RankedDevice, Net, T> : public detail::LockstepPath<GradientPath<RankedDevice, Net, T>, RankedDevice, Net, T> {
    using Base = detail::LockstepPath<GradientPath, RankedDevice, Net, T>;

public:
    using Base::lockstep, Base::pipelined, Base::captures_step, Base::unit_network, Base::model_summary;
    using Base::gradient_buckets, Base::expected_updates, Base::end_epoch, Base::per_worker_input;
    using Base::sum_over_workers, Base::sum_outputs_over_workers, Base::after_save, Base::gathers_state, Base::bind_unit;
    using Base::gradient_ready, Base::end_step, Base::combine_totals;

    template <class Init>
    GradientPath(RankedDevice& s, Init&& init) : Base(s), rank_(s.rank) {
        params_.resize(Shape{Net::num_params});
        init(params_.data());
    }
    bool is_cheif() const { return rank_ == 0; }  // meant: is_chief

    T* params(int) { return params_.data(); }
    void compile(const optim::Optimizer& o, const distribute::collective::Settings&) { this->opt_.states.assign(1, optim::OptimizerState<T, place::Host>(o, Net::num_params)); }
    void apply(int r) { this->opt_.states[0].apply(params_.data(), this->grads(r)); }
    std::vector<T> get_weights() const { return to_vector(params_.view()); }
    void set_weights(const std::vector<T>& w) { std::copy(w.begin(), w.end(), params_.data()); }
    void log_placement() {}

private:
    int rank_;
    Tensor<T, place::Host> params_;
};
}  // namespace strata::distribute

using Net = strata::nn::Sequential<strata::nn::Input<4>, strata::nn::Dense<2>>;
int main() {
    RankedDevice strategy;
    strata::Model<Net, RankedDevice> model(strategy);
}

// A place algorithm on a user place (a type with a place_tag): only Host and, in nvcc units, Cuda
// have algorithms; a user place's layers write their own loops.
// expect: strata::place::for_each_n: no algorithms for this place
#include <strata/strata.hpp>
struct MyPlace {
    using place_tag = MyPlace;
    static constexpr const char* name = "MyPlace";
    static constexpr bool host_accessible = true;
};
struct Touch {
    void operator()(std::int64_t) const {}
};
int main() { strata::place::for_each_n<MyPlace>(std::int64_t(4), Touch{}); }

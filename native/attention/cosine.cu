// The attention passes of kind kCosine (AGNNConv): forward, target-side and source-side
// backward, instantiated for this kind alone so that each kind compiles in
// its own translation unit.
#include "host.cuh"

namespace gnnio {
namespace attention {

template struct KindOps<kCosine>;

}  // namespace attention
}  // namespace gnnio
